"""Declarations a model writes code against: the `dts` TypeScript module and the `prompt` lines.

Pure functions of a toolset's tools (no I/O); the same tools always give the same text.

- `render_dts(tools, module_name)`: the whole `declare module "<module_name>"` text.
- `render_prompt(tools)`: one line per tool, sorted by qualified name.
- `tool_dts_fragment(tool)` and `tool_prompt_line(tool)`: one tool's part, as search shows it.
- `declarations_floor(tools)`: a lower bound on their size, without rendering.
"""

from toolbus_registry.declarations.dts import render_dts, tool_dts_fragment
from toolbus_registry.declarations.prompt import render_prompt, tool_prompt_line
from toolbus_registry.declarations.size import declarations_floor

__all__ = ["declarations_floor", "render_dts", "render_prompt", "tool_dts_fragment", "tool_prompt_line"]
