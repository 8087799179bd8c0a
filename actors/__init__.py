"""The two sides of a served round as plain classes: ``TargetActor`` and ``DrafterActor``.

They wrap the core's ``TargetWorker`` / ``DraftWorker`` and hold per-request state by request
id. ``ray.remote`` is applied only in ``cluster/``; nothing here imports ray.
"""
