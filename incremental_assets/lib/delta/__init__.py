"""Delta Lake: how an asset table is written (spec), the one write module, reads with and without a JVM, and the IO manager."""
