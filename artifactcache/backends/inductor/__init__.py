"""inductor: torch.compile, with its Mega-Cache and kernel files kept in the entry."""
