"""Where a loader's time goes (``autotune diagnose``) and pictures of a search (``autotune report``)."""
