"""Execution: the bytes of a plan, written into a work folder (stage 6 of docs/architecture.md).

Executors only produce bytes: ``local.produce`` and ``ray_executor.produce`` take the same plan,
work folder (``partial``, the ``done`` tasks, ``journal``) and :class:`~.context.RunContext`, write
every remaining task at its planned offset and journal it. Inside: ``schedule`` (every task's steps
and reads), ``pipeline`` (read ahead, write behind), ``compute`` (quantize, pack, check), ``execute``
(the coordinator), ``kernel_choice`` (``--kernels``), ``options`` (``--executor``/``--device``/
``--kernels`` checks). Ray (``partition``, ``ray_executor``, ``ray_tasks``) is an optional extra
(``pip install 'quantize-cli[ray]'``), imported only inside those modules.
"""
