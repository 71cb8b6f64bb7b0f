"""Small helpers over user tables (the system table has durafn.testing)."""

from __future__ import annotations

from sqlalchemy import func, select

import durafn

from .models import Base, Counter


async def count(app: durafn.App, model: type[Base]) -> int:
    async with app.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(model))).scalar_one())


async def counter(app: durafn.App, name: str = "c") -> int:
    async with app.engine.connect() as conn:
        value = (await conn.execute(select(Counter.value).where(Counter.name == name))).scalar()
        return int(value or 0)
