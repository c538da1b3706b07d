"""Real multi-site federation on Flower: the same method code as the in-process engine.

* :mod:`~fedseg.engine.flower.records`: payloads and metrics as Flower records.
* :mod:`~fedseg.engine.flower.site`: a site's side (a :class:`~fedseg.engine.worker.SiteWorker`
  over its own data); :mod:`~fedseg.engine.site_state` keeps the private state on the
  site's disk.
* :mod:`~fedseg.engine.flower.link`: the engine's round loop (:mod:`fedseg.engine.loop`, the
  same as in-process) over Flower messages, with any transport.
* :mod:`~fedseg.engine.flower.server_app` / :mod:`~fedseg.engine.flower.client_app`: the
  server over Flower's Grid and the ``ClientApp`` (the ``ServerApp`` entry point, which also
  renders the table and figures, is :mod:`fedseg.flower_server_app`).
* :mod:`~fedseg.engine.flower.launcher`: a SuperLink and SuperNodes on loopback;
  :mod:`~fedseg.engine.flower.cli`: ``fedseg flower``; :mod:`~fedseg.engine.flower.privacy`:
  what leaves a site; :mod:`~fedseg.engine.flower.tls`: pilot certificates and node keys.

Importing this package (or the CLI module) does not import Flower; the other modules need
the ``flower`` extra (``pip install 'fedseg[flower]'``).
"""
