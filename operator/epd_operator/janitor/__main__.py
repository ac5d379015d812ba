"""`python -m epd_operator.janitor`: the same as `epdctl janitor`."""

from .sidecar import main

main()
