"""One keyset paginator for every list endpoint (jobs, flags, nodes): order by (sort key,
tiebreaker), continue strictly after the cursor's pair, fetch one extra row to know whether
there is a next page. Cursors are opaque (``common.encode_cursor``) and checked on the way in:
a forged or stale cursor is a 400, never a 500 or a wrong page.

Hand-written rather than sqlakeyset: that library wraps the session and result types and
pickles its markers; here a cursor is two JSON values, which the fuzz tests can reason about."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVarTuple

from sqlalchemy import Select, and_, or_

from .common import BadRequest, decode_cursor, encode_cursor

Types = type | tuple[type, ...]
Row = TypeVarTuple("Row")


@dataclass(frozen=True)
class Keyset:
    key: Any  # the sort column (a column or labelled expression)
    tiebreak: Any  # unique within equal keys (a primary key, or the next name column)
    key_type: Types
    tiebreak_type: Types
    descending: bool = False

    def apply(self, q: Select[*Row], cursor: str | None) -> Select[*Row]:
        """``q`` ordered by the keyset and, with a cursor, restricted to rows after it."""
        after = decode_cursor(cursor, 2)
        if after is not None:
            k, t = after
            if not isinstance(k, self.key_type) or not isinstance(t, self.tiebreak_type):
                raise BadRequest("cursor is not one this API issued")
            if self.descending:
                q = q.where(or_(self.key < k, and_(self.key == k, self.tiebreak < t)))
            else:
                q = q.where(or_(self.key > k, and_(self.key == k, self.tiebreak > t)))
        if self.descending:
            return q.order_by(self.key.desc(), self.tiebreak.desc())
        return q.order_by(self.key.asc(), self.tiebreak.asc())

    @staticmethod
    def page(rows: Sequence[Any], limit: int,
             cursor_of: Callable[[Any], Sequence[Any]]) -> tuple[list[Any], str | None]:
        """The first ``limit`` of ``rows`` (fetched with ``limit + 1``) and the next page's cursor."""
        more = len(rows) > limit
        page = list(rows[:limit])
        return page, (encode_cursor(cursor_of(page[-1])) if more and page else None)
