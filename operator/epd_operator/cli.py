"""`epdctl` (placeholder until the foundation issue lands)."""
import sys


def main() -> None:
    sys.exit("epdctl: not implemented yet")
