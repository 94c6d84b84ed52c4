"""A problem found by a rule, as data: which rule (a stable id), about what, and the one-line message.

Modules that compute facts (modules/experts.py, formats/, layouts/) return :class:`Problem` s;
plan/validate.py decides what each is (error or warning) and turns it into a :class:`Finding`. Callers branch on ``rule``, never on the message's text. Torch-free, imports nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Rule ids of the problems computed outside validate.py (validate.py lists every rule).
EXPERT_LAYOUT = "expert-layout"  # a fused 3-D expert tensor whose layout is undeclared or does not split
EXCLUDE_MISREAD = "exclude-misread"  # vLLM would read the exclude / ignore list otherwise than planned
LAYOUT_UNSUPPORTED = "layout-unsupported"  # no kernel layout to pre-pack this algorithm into
LAYOUT_NO_BYTES_MOVE = "layout-no-bytes-move"  # the kernel reads the plain bytes: nothing to pre-pack
CALIB_IGNORED = "calib-ignored"  # calibration asked for, but nothing it measures decides a byte


@dataclass(frozen=True)
class Problem:
    """One rule broken: ``rule`` (a stable id above), ``subject`` (the tensor, module or option it is
    about) and ``message`` (one line naming the subject, the rule and the fix)."""

    rule: str
    subject: str
    message: str


ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Finding:
    """One result of a rule: level (error/warning), a stable code, what it is about, one line."""

    level: str
    code: str
    subject: str
    message: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, level: str, problem: Problem) -> "Finding":
        """The finding for a :class:`Problem` computed elsewhere, at the `level` this module decides."""
        return cls(level, problem.rule, problem.subject, problem.message)


class FindingsResult:
    """Mixin for results holding ``self.findings``: the errors and the warnings among them."""

    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]
