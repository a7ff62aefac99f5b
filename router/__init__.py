# The topic index is compiled with the codec: the same switch, whichever package is imported first.
from brokerd.connection import _compiled  # noqa: F401
