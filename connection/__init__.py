# The hot path compiled or pure (connection/_compiled.py), decided before any of its modules loads.
from . import _compiled  # noqa: F401
