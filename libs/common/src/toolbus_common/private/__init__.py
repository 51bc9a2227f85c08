"""Everything of toolbus_common (and the services) that reaches into a dependency's private parts,
in one place: each module names the pinned version it was written against, and
tests/common/test_private_attributes.py fails when an upgrade takes away what it uses. See README.md
for the list (mcp-client's own are listed there too) and the figure that keeps each."""
