"""An EPDDeployment run on this machine without a cluster (``make demo``, the e2e tests, the end-to-end bench):
the rendered objects turned into local processes (``plan``, with ``argv`` and ``volumes``), run and stopped
(``runner``), sized for a small CPU (``cpu_sizing``), talked to (``client``) and checked (``kv_transfer``);
``demo`` is ``make demo``."""
