"""Shared parameter types and the session dependency for the API routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.orm import Session

# No NUL or other C0 control characters: PostgreSQL refuses NUL in text, and no real job
# id, user or node name has them; refusing them up front keeps every answer a clean 4xx.
SAFE = r"^[^\x00-\x1f\x7f]*$"


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as s:
        yield s


SessionDep = Annotated[Session, Depends(get_session)]
Text = Annotated[str | None, Query(max_length=256, pattern=SAFE)]
ClusterQ = Annotated[str, Query(max_length=128, pattern=SAFE, description='cluster name; "default" when omitted')]
ClusterFilter = Annotated[str | None, Query(max_length=128, pattern=SAFE, description="only this cluster")]
Cursor = Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_\-]*$",
                                     description="next_cursor from the previous page")]
JobIdPath = Annotated[str, Path(max_length=255, pattern=SAFE, description="the scheduler's job id")]
NamePath = Annotated[str, Path(max_length=255, pattern=SAFE)]
