"""Ray actors (plain classes over specdec workers): DrafterWorker and TargetWorker.

Filled in by the serving issue (#3); ray.remote is applied only in cluster/.
"""
