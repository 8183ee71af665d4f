"""Independent test peers for the Hurray network transport.

Everything in this package is written from the spec's tables (``docs/spec`` of the
reference repository) with :mod:`struct` and the standard library only.  It must never
import ``hurray_schema``: the peers exist to check that project's wire bytes from the
outside, so sharing its codec, enums or constants would make the check circular.

* :mod:`support.peers.spec_wire` -- encoders and decoders of every transport message and a
  minimal tensor-descriptor builder and reader;
* :mod:`support.peers.spec_client` -- :class:`~support.peers.spec_client.SpecClient`, a blocking client;
* :mod:`support.peers.spec_server` -- :class:`~peers.spec_server.SpecServer`, a scripted server
  that can answer correctly or break the protocol on purpose;
* :mod:`support.peers.spec_session` -- :func:`~support.peers.spec_session.judge`, the first fault
  a receiver finds in one recorded direction of a session (the corpus's session vectors).
"""
