"""Thin adapters between agent frameworks and Dataoad, each behind its own extra.

``dataoad.integrations.pydantic_ai``, ``.openai_agents``, ``.langgraph`` and
``.mcp`` import their framework; the core never does. They all build on
``dataoad.GuardedTool`` and hand the model ``ToolOutcome.message``.
"""
