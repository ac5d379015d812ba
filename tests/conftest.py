pytest_plugins = ["tests.support.cluster"]
