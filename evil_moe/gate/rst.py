"""Text into the report as a literal: config and result text (model names, paths, pilots'
reasons, notes) placed in the reStructuredText that docutils renders into ``report.html``.

The report is shared, so text from a config or a result file must show as what it says and
never act as markup: a directive (``.. raw:: html``, ``.. include::``) needs a line of its own,
and inline markup (a hyperlink to ``javascript:``, a role, a substitution) needs its start
characters. :func:`rst_text` takes both away; the docutils settings of the report
(``report/docutils.conf``: raw and file insertion off, :func:`evil_moe.workflow.report_docutils`)
are the second wall, for text this module never sees.
"""

from __future__ import annotations

import re

# What can start or end inline markup, a reference, a substitution, a footnote or a role, and
# the escape itself: a backquote, an asterisk, a bar, a backslash; an underscore unless it is
# inside a word (``name_`` is a reference, ``_name`` a target, ``drop_vs_vanilla`` is text; a
# footnote's ``[1]_`` ends in such an underscore); an at sign (a standalone e-mail address); a
# colon with text after it (a role's, or a standalone URI's scheme: ``javascript:...``).
_MARKUP = re.compile(r"[\\`*|@]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|:(?=\S)")
# What opens a block at the start of a line: a list's enumerator (``1.``, ``a)``), or any other
# punctuation (``..`` a directive or comment, ``-`` ``+`` a list, ``=`` ``|`` a table or a line block).
_OPENER = re.compile(r"^(?:[A-Za-z0-9]+[.)]|[^A-Za-z0-9\\])")


def rst_text(text: object, line_start: bool = True) -> str:
    """``text`` as reStructuredText that renders as that text, on one line.

    Whitespace runs (newlines included) become one space, so the text cannot open a line of its
    own (a directive, a comment, a table); every character that can start inline markup, a
    reference, a substitution, a role or an e-mail link (:data:`_MARKUP`: ``\\ ` * | @``, an
    underscore at a word's edge, a colon with text after it as in ``javascript:``) is
    backslash-escaped. With ``line_start`` (the text may begin a line or a list item) a start
    that would open a block (punctuation, as in ``.. raw::`` or ``- x``, or an enumerator such
    as ``1.``) has its punctuation escaped too. docutils renders a backslash-escaped character
    as itself, so the page shows the text unchanged.

    Example: ``rst_text(".. raw:: html <script>")`` is ``r"\\.. raw\\:: html <script>"``.
    """
    flat = " ".join(str(text).split())
    escaped = _MARKUP.sub(lambda m: "\\" + m.group(0), flat)
    opener = _OPENER.match(escaped) if line_start else None
    if opener:  # escape its last character: docutils then reads the text as a paragraph's
        end = opener.end() - 1
        escaped = escaped[:end] + "\\" + escaped[end:]
    return escaped


__all__ = ["rst_text"]
