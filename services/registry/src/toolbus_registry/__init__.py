"""toolbus registry: toolsets, pinning, declarations, search, workflows."""
