"""The only package that speaks Redis: keys, Lua scripts, streams, views, locks, the embedded server."""
