"""The names and fixed parameters of the data-driven weight methods (torch-free: the options read them).

``--rounding``: ``nearest`` (the scheme's own rounding) or ``gptq`` (:mod:`.gptq`);
``--smooth``: ``none``, ``awq`` or ``smoothquant`` (:mod:`.smooth`).
"""

ROUNDINGS = ("nearest", "gptq")
SMOOTHING = ("none", "awq", "smoothquant")
AWQ_GRID = 20  # AWQ's grid points (llm-compressor's n_grid): s = 1, then 19 exponents from 0 to 1
SMOOTHQUANT_ALPHA = 0.5  # SmoothQuant's migration strength (llm-compressor's default)
