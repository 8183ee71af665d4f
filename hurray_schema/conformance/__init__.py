"""The conformance corpus: for every rule that input bytes can trigger, a passing and a violating input.

``hurray-schema vectors OUTDIR`` writes it (:func:`write_corpus`); ``--check`` reports
drift (:func:`check_corpus`).  The vectors are generated (:mod:`.descriptors`,
:mod:`.composites`, :mod:`.containers`) from the writers with ``validate=False`` and
field patches located through the declarations (:mod:`.patch`); their expected verdicts
come from our readers (:mod:`.verdicts`) and, when installed, pyhurray's
(:mod:`.reference`).  The transport rules' vectors are recorded sessions (:mod:`.sessions`), played
at this project's own server; :mod:`.replay` plays one at a server or a client under test
(``hurray-schema replay``).  The manifest schema is in README.md (§ Conformance vectors).
"""

from .case import EXTENSIONS, KINDS, Case
from .corpus import (
    LINTS, MANIFEST, NO_VECTOR, SCHEMA, Corpus, Vector, all_cases, build_corpus, check_corpus, hex_around, manifest,
    write_corpus,
)
from .verdicts import Verdict, read_verdict

__all__ = [
    "Case", "Corpus", "EXTENSIONS", "LINTS", "KINDS", "MANIFEST", "NO_VECTOR", "SCHEMA", "Vector", "Verdict",
    "all_cases",
    "build_corpus", "check_corpus", "hex_around", "manifest", "read_verdict", "write_corpus",
]
