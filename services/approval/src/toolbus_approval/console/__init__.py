"""The approvals web console: people sign in (OpenID Connect, or a development token), see the
pending approvals their groups cover, decide them (editing the input), revoke remembered decisions
and read the history; served by the approval service on its own port (`TOOLBUS_CONSOLE_PORT`)."""
