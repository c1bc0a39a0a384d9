"""The torch.distributed interpreter of a compiled Program (imported as ``schedc.runtime``).

Not built yet: it arrives with the runtime issue (#6). This package exists so that the layout
of DESIGN.md, and the ``schedc.runtime`` import path, are fixed from the start.
"""
