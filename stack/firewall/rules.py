"""The firewall's rules and cost model.

A :class:`RuleSet` scans text with keyword (case-insensitive substring) and regex rules and
reaches one decision, in this precedence:

* ``block_pattern`` - a ``block`` rule matched;
* ``block_analysis`` / ``allow_after_analysis`` - an ``analyze`` rule matched, so the slow deep
  analysis runs; it blocks when any matched analyze rule has ``analysis_blocks: true``;
* ``modify`` - a ``modify`` rule matched: matches are replaced by its ``replacement``;
* ``allow``.

Modify rules are also applied under ``allow_after_analysis``. The time a decision takes is
``cost.fixed + cost.per_token_ms * tokens`` plus ``cost.deep_analysis`` on the analysis paths, so
the expected per-decision latency is known from the config (:func:`expected_ms`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from deltatap.stack.config import InspectionCost, Rule
from deltatap.stack.delays import DelaySampler


class Decision(StrEnum):
    ALLOW = "allow"
    ALLOW_AFTER_ANALYSIS = "allow_after_analysis"
    BLOCK_PATTERN = "block_pattern"
    BLOCK_ANALYSIS = "block_analysis"
    MODIFY = "modify"

    @property
    def blocks(self) -> bool:
        return self in (Decision.BLOCK_PATTERN, Decision.BLOCK_ANALYSIS)

    @property
    def analyzed(self) -> bool:
        return self in (Decision.ALLOW_AFTER_ANALYSIS, Decision.BLOCK_ANALYSIS)


@dataclass
class Verdict:
    decision: Decision
    rules: list[str] = field(default_factory=list)


class _Compiled:
    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        parts = [re.escape(k) for k in rule.keywords]
        pattern = "|".join([f"(?i:{p})" for p in parts] + [f"(?:{r})" for r in rule.regex])
        self.re = re.compile(pattern)

    def matches(self, text: str) -> bool:
        return self.re.search(text) is not None

    def apply(self, text: str) -> str:
        return self.re.sub(self.rule.replacement, text)


class RuleSet:
    def __init__(self, rules: list[Rule]) -> None:
        self._rules = [_Compiled(r) for r in rules]
        self._modifiers = [c for c in self._rules if c.rule.action == "modify"]

    def scan(self, text: str) -> Verdict:
        hit = {"block": [], "analyze": [], "modify": []}
        for c in self._rules:
            if c.matches(text):
                hit[c.rule.action].append(c.rule)
        if hit["block"]:
            return Verdict(Decision.BLOCK_PATTERN, [r.name for r in hit["block"]])
        if hit["analyze"]:
            blocks = any(r.analysis_blocks for r in hit["analyze"])
            names = [r.name for r in hit["analyze"]] + [r.name for r in hit["modify"]]
            return Verdict(Decision.BLOCK_ANALYSIS if blocks else Decision.ALLOW_AFTER_ANALYSIS, names)
        if hit["modify"]:
            return Verdict(Decision.MODIFY, [r.name for r in hit["modify"]])
        return Verdict(Decision.ALLOW)

    def modify(self, text: str) -> str:
        for c in self._modifiers:
            text = c.apply(text)
        return text


def cost_ms(cost: InspectionCost, tokens: int, verdict: Verdict, sampler: DelaySampler) -> float:
    """One draw of the time this inspection takes."""
    ms = sampler.draw_ms(cost.fixed) + cost.per_token_ms * tokens
    if verdict.decision.analyzed:
        ms += sampler.draw_ms(cost.deep_analysis)
    return ms


def expected_ms(cost: InspectionCost, tokens: int, decision: Decision) -> float:
    """The configured mean latency of a decision over ``tokens`` tokens (uniform/normal jitter)."""
    ms = cost.fixed.fixed_ms + cost.per_token_ms * tokens
    return ms + (cost.deep_analysis.fixed_ms if decision.analyzed else 0.0)
