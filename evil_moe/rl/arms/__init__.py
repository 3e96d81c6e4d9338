"""The arms: the interface (``base``), the families (``by_projection``, ``by_data``,
``reference``), the registry ``ARMS`` (``registry``) and the files a pilot of an arm reads
(``pilot_inputs``). Above :mod:`evil_moe.rl.detectors`."""
