"""PBS Pro as a node source: the controller harvests a PBS cluster's free nodes with pilot jobs (``pilots``),
reading ``pbsnodes -a -F json`` and ``qstat -f -F json`` and acting with ``qsub`` and ``qdel`` (``commands``)."""
