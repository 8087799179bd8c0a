"""The Ray Serve application and its builders (serving issue #3).

Deployments are plain classes; serve.deployment is applied only in a builder here.
"""
