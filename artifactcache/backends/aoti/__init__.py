"""aoti: AOTInductor packages, one per step, built concurrently in worker processes."""
