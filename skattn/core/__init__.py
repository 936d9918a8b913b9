"""The torch-free core that both halves of skattn stand on.

The training side (``skattn.estimator``, ``skattn.models``, ``skattn.export``) and the serving side
(``serving``) import this package; it imports neither, nor torch, nor scikit-learn, only NumPy::

    text        strings <-> tokens <-> ids; vocabularies; padding
    search      greedy and beam search over any backend (encode / step / select)
    memory_rows which encoder memory rows a step reads (one per row, or one per item)
    inference   the one inference layer: sources -> length-sorted chunks -> search -> outputs
    manifest    the artifact contract: the Manifest record, graph names, format version
    checks      the shared validators (integers, devices, cores)
"""
