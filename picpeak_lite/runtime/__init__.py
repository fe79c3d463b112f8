"""The runtime parts every layer may be given through ``Services``: the bells that wake background tasks, the
broker, the upload backlog, the decode memory budget, the memory trimmer and the activity counters.

They sit below ``domain/``, ``events/`` and ``pipeline/`` and import only ``store/`` and the standard library, so
``services.py``, which holds one of each, imports nothing from the layers that are given it.
"""
