"""The language: text -> checked IR.

grammar (Lark), IR nodes and printer, index rules and algebra, functions, numbers, errors.
"""
