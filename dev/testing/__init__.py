"""How the tests are run beyond pytest itself: ``make test``'s two runs side by side (``test_streams``) and
``make mutation``'s mutation score (``mutation``, with the survivors it explains in ``mutation_survivors.toml``)."""
