"""Text -> IR: the Lark LALR parser for einflow, with friendly ParseErrors."""

from __future__ import annotations

from einflow.lang.grammar.parser import parse, parse_expression

__all__ = ["parse", "parse_expression"]
