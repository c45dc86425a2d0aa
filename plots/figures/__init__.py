"""Figure builders. Each takes results rows and returns a matplotlib Figure (not yet
saved), or raises NotPlottable saying why the rows cannot support the figure."""
