"""The job use cases every edge stands on: the commands a caller gives, the rules they follow, the one
write path and the service. `http`, `driver` and `board` import from here; nothing here imports them."""
