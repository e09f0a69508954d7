"""A strict-enough HTML check for the report page (headless Chromium is not installed here).

Parses the page with the standard library, checks that tags balance, collects every element id,
decodes every ``<img>`` data URI and lists any reference to an external resource.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "img", "br", "hr", "link", "input", "source", "col", "area", "base", "wbr"}


@dataclass
class Page:
    title: str = ""
    images: list[bytes] = field(default_factory=list)
    image_mimes: list[str] = field(default_factory=list)
    external_refs: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    tables: int = 0


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self.stack: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.page.ids.add(a["id"])
        if tag == "table":
            self.page.tables += 1
        if tag == "title":
            self._in_title = True
        for key in ("src", "href"):
            v = a.get(key)
            if v is None:
                continue
            if v.startswith("data:"):
                head, _, payload = v.partition(",")
                if tag == "img":
                    if not head.endswith(";base64"):
                        raise AssertionError(f"image data URI is not base64: {head}")
                    self.page.image_mimes.append(head[5:].split(";")[0])
                    self.page.images.append(base64.b64decode(payload, validate=True))
            elif not v.startswith("#"):
                self.page.external_refs.append(v)
        if tag == "img" and "src" not in a:
            raise AssertionError("img without src")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            raise AssertionError(f"unbalanced </{tag}>; open: {self.stack[-5:]}")
        self.stack.pop()
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.page.title += data


def parse_page(html: str) -> Page:
    assert html.lstrip().lower().startswith("<!doctype html>")
    p = _Parser()
    p.feed(html)
    p.close()
    assert not p.stack, f"unclosed tags: {p.stack}"
    return p.page
