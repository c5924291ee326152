"""Reading two recorded runs and judging them: ``npu-migrate compare A B``. Torch-free.

* :mod:`.sources`: what compare can read: probe directories, ``--metrics`` JSON lines, plain logs.
* :mod:`.align`: lining two runs up by name: ranks, steps, metrics, module entries, what one side lacks.
* :mod:`.tolerance`: when two numbers count as the same: exact, explicit rtol/atol, dtype-aware defaults.
* :mod:`.verdict`: judging two runs: the first step out of tolerance, the largest errors, the culprit.
* :mod:`.module_verdict`: judging module records: each entry's closeness and the first culprit module.
* :mod:`.comparison`: the result: per-metric summaries, module findings, the culprit, the verdict.
* :mod:`.report`: what a comparison says: the markdown summary and its ``--json`` form.
* :mod:`.plot`: ``--plot FILE.png``: both runs' curves and their difference.
"""
