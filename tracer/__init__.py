"""whyrestart: why did my model container restart when the host says memory is free?"""

__version__ = "0.1.0"
