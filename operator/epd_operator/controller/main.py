"""Console entry point (placeholder until its issue lands)."""
import sys


def main() -> None:
    sys.exit("epd-operator: not implemented yet")
