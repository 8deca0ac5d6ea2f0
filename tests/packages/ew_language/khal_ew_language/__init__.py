"""The "elementwise" kernel language: a hatch-khal language plugin (build side: ``build``; run
time: ``runtime``)."""
