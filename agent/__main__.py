import sys

sys.exit("sp00ky agent: not built yet (issues #4 and #5)")
