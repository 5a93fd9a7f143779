"""What each notebook's runs showed, as sentences computed from its run records.

One module per notebook, named like it: ``notebooks/NN_<slug>.ipynb`` ends with a call
into ``findings/<slug>.py``; ``base`` holds what a finding is. A notebook imports its own
module (``from workshop_lib.findings import welcome as verdicts``).
"""
