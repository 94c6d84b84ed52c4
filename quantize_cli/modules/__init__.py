"""What a checkpoint's modules are, from names and header shapes alone (torch-free).

``classify`` (every module's kind and whether it is quantized), ``matching`` (vLLM's reading of
``exclude_modules`` patterns, also the rule of ``--exclude`` / ``--algo-for``), ``recipe`` (the
per-family data: fused groups, default exclusions, MoE names), ``experts`` (fused 3-D expert
tensors split per expert), ``parallel`` (how vLLM splits a Linear across tensor-parallel ranks) and
``tied_head`` (the LM head a model ties to its embeddings: a Linear with no tensor in the file).
The formats, calibration and the plan all build on these facts; they import nothing above them.
"""
