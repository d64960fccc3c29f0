// Placeholder translation unit until the ensemble layer lands (removed by then).
