-- python/3.11-system: puts the SYSTEM python3 (/usr/bin/python3, without cudalab's
-- dependencies) first on PATH, as a site's Python module would (issue 25, defect 1)
whatis("system Python 3.11")
prepend_path("PATH", "@STATE@/pybin")
