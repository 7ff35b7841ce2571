"""A discrete-event cluster model for projecting routing policies to more nodes."""
