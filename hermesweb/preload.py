"""The ES modules a page's entry scripts import, to be announced with `<link rel="modulepreload">`.

Design note: docs/ui.md ("Loading"). There is no bundler: without the links the browser finds
each level of imports only after fetching and parsing the one above, a waterfall of round trips
before the first line runs (~0.4 s of a long session's time to interactive).
"""

from __future__ import annotations

import functools
import posixpath
import re
from pathlib import Path

from django.conf import settings

# Static `import … from '…'` and `import '…'` with a relative specifier: the only kind the
# workbench's modules use (dynamic `import()` is loaded on demand and left out on purpose).
IMPORT = re.compile(r"""^\s*(?:import|export)\s(?:[^'"]*?\sfrom\s)?['"](\.{1,2}/[^'"]+)['"]""", re.MULTILINE)


@functools.cache
def module_closure(*entries: str) -> tuple[str, ...]:
    """Every module reachable from `entries` (paths under the static root, e.g. "js/main.js"),
    entries first, each once, in the order found."""
    root = Path(settings.STATICFILES_DIRS[0])
    seen: dict[str, None] = {}
    stack = list(reversed(entries))
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen[path] = None
        source = (root / path).read_text(encoding="utf-8")
        found = [
            posixpath.normpath(posixpath.join(posixpath.dirname(path), spec))
            for spec in IMPORT.findall(source)
        ]
        stack.extend(reversed(found))
    return tuple(seen)
