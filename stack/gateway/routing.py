"""Routing by model name to upstream pools, with a balancing policy per route."""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable

from deltatap.stack.config import Route


class Pool:
    """The upstreams of one route and how many requests each has outstanding."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.outstanding = {u: 0 for u in route.upstreams}
        self._rr = itertools.cycle(route.upstreams)
        self.pick: Callable[[], str] = POLICIES[route.policy](self)

    def acquire(self) -> str:
        url = self.pick()
        self.outstanding[url] += 1
        return url

    def release(self, url: str) -> None:
        self.outstanding[url] -= 1


def _round_robin(pool: Pool) -> Callable[[], str]:
    return lambda: next(pool._rr)


def _least_outstanding(pool: Pool) -> Callable[[], str]:
    # ties go round robin, so an idle pool still spreads load
    def pick() -> str:
        low = min(pool.outstanding.values())
        for _ in range(len(pool.outstanding)):
            u = next(pool._rr)
            if pool.outstanding[u] == low:
                return u
        return next(pool._rr)

    return pick


POLICIES: dict[str, Callable[[Pool], Callable[[], str]]] = {
    "round_robin": _round_robin,
    "least_outstanding": _least_outstanding,
}


class Router:
    """First route whose ``model`` glob matches the requested model."""

    def __init__(self, routes: list[Route]) -> None:
        self.pools = [Pool(r) for r in routes]

    def route(self, model: str) -> Pool | None:
        return next((p for p in self.pools if fnmatch.fnmatchcase(model, p.route.model)), None)
