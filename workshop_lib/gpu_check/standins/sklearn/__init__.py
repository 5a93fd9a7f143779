"""A stand-in for scikit-learn, used only by ``workshop_lib.gpu_check --smoke`` where the
real package is missing (see ../README.md): just ``datasets.load_digits``."""
