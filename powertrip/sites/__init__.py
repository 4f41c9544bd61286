"""The world a run trains in: sites and their links, the paper's time model (Eqs. 3, 4, 6, 7)
and short-term forecasts of each site's spare power."""
