"""Files in and out: reading INPUT rows (inputs), writing and reading OUTPUT rows (outputs), the HTML pages (report).
May import core/ and analysis/."""
