"""scripts/image-check's parts: the engine, the base image, launching the image, the checks, compose.yaml."""
