"""The operator console (SPEC S8), served at /console when CONSOLE_ENABLED."""
