"""Executors beyond the local pipeline: the same plan, run elsewhere.

``partition`` splits a plan into units of output shards (pure data, no Ray); ``ray_executor`` runs
those units as Ray tasks from the driver; ``ray_tasks`` is what runs on the workers. Ray is an
optional extra (``pip install 'quantize-cli[ray]'``) imported only inside these functions.
"""
