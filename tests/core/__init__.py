"""The library's parts on their own, no runner: limiter, pacing, auto limit, results, errors, public face."""
