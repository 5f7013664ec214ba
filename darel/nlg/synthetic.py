"""Synthetic stand-ins for E2E-NLG and WebNLG 2017, built from the real schemas.

Models and data cannot be downloaded in the offline test environment. The generators
draw inputs from the real slot/predicate schemas and realise each input with several
independently templated English references, every one of which mentions every input
value. They are stand-ins for plumbing and timing, not for the scores of the paper.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from darel.nlg.schemas import E2E_SLOT_ORDER, NLGExample, entity_text, format_mr, linearise_triples

# ---------------------------------------------------------------------------
# E2E-NLG

# Real value sets of the closed slots; ``name`` and ``near`` are open (venue names):
# invented names stand in for them.
E2E_VENUE_NAMES = (
    "The Copper Kettle", "The Wandering Fox", "Blue Heron", "The Olive Branch", "Saffron Court",
    "The Silver Birch", "Harbour Lights", "The Red Lantern", "Juniper House", "The Quiet Otter",
    "Maple Yard", "The Gilded Spoon", "Lotus Garden", "The Old Mill", "Bramble Corner",
    "The Brass Anchor", "Golden Pagoda", "The Velvet Plum", "Riverstone", "The Tin Whistle",
)
E2E_LANDMARK_NAMES = (
    "Clare Bridge", "The Corn Exchange", "Market Square", "St Anne's Church", "Kingfisher Park",
    "The Guildhall", "Cherry Lane Cinema", "The Ferry Terminal", "Northgate Station", "Hollow Oak Library",
    "The Bluebell Inn", "Castle Mound", "The Rowing Club", "Elmwood Theatre",
)
E2E_SLOTS: dict[str, tuple[str, ...]] = {
    "name": E2E_VENUE_NAMES,
    "eatType": ("coffee shop", "pub", "restaurant"),
    "food": ("Chinese", "English", "Fast food", "French", "Indian", "Italian", "Japanese"),
    "priceRange": ("cheap", "less than £20", "£20-25", "moderate", "high", "more than £30"),
    "customer rating": ("1 out of 5", "3 out of 5", "5 out of 5", "low", "average", "high"),
    "area": ("city centre", "riverside"),
    "familyFriendly": ("yes", "no"),
    "near": E2E_LANDMARK_NAMES,
}

def _article(phrase: str) -> str:
    return "an" if phrase[:1].lower() in "aeiou" else "a"


def _food_noun(food: str) -> str:
    # "Fast food" is already a noun phrase; the cuisines are adjectives.
    return "fast food" if food.lower() == "fast food" else f"{food} food"


def _food_adjective(food: str) -> str:
    return "fast food" if food.lower() == "fast food" else food


def _join_phrases(phrases: Sequence[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _sentence(text: str) -> str:
    text = text.strip().rstrip(".")
    return text[0].upper() + text[1:] + "."


def _e2e_verb_phrase(slot: str, value: str, rng: random.Random) -> str:
    """A verb phrase (no subject) that states ``slot = value``, quoting the value."""
    numeric_rating = value[:1].isdigit()
    amount_price = "£" in value
    options: dict[str, list[str]] = {
        "food": [f"serves {_food_noun(value)}", f"offers {_food_noun(value)}", f"has {_food_noun(value)} on the menu"],
        "priceRange": [
            f"is in the {value} price range",
            f"has a {value} price range",
            f"has prices in the {value} range" if not amount_price else f"charges {value} per meal",
        ],
        "customer rating": (
            [f"has a customer rating of {value}", f"is rated {value} by customers", f"has been rated {value} by its guests"]
            if numeric_rating
            else [f"has a {value} customer rating", f"is rated {value} by customers", f"has an {value} rating" if value[0] in "aeiou" else f"has a {value} rating"]
        ),
        "area": [f"is located in the {value} area", f"is in the {value}", f"can be found in the {value} area"],
        "familyFriendly": (
            ["is family-friendly", "is family friendly", "welcomes families", "is a good choice for families"]
            if value == "yes"
            else ["is not family-friendly", "is not family friendly", "is not suitable for families", "does not welcome families"]
        ),
        "near": [f"is near {value}", f"is located near {value}", f"is close to {value}", f"can be found near {value}"],
    }
    if slot not in options:
        raise ValueError(f"no phrase for E2E slot {slot!r}")
    return rng.choice(options[slot])


def _e2e_reference(slots: dict[str, str], rng: random.Random) -> str:
    """One templated English reference that mentions every slot value of ``slots``."""
    name = slots["name"]
    noun = slots.get("eatType") or rng.choice(["venue", "place", "spot"])
    remaining = [slot for slot in E2E_SLOT_ORDER if slot in slots and slot not in ("name", "eatType")]

    food = slots.get("food")
    food_in_intro = food is not None and rng.random() < 0.7
    if food_in_intro:
        remaining.remove("food")
        described = f"{_food_adjective(food)} {noun}"
        intro = rng.choice(
            [
                f"{name} is {_article(described)} {described}",
                f"there is {_article(described)} {described} called {name}",
                f"{name} is {_article(noun)} {noun} that serves {_food_noun(food)}",
                f"{_article(noun)} {noun} named {name} offers {_food_noun(food)}",
            ]
        )
    else:
        intro = rng.choice(
            [f"{name} is {_article(noun)} {noun}", f"there is {_article(noun)} {noun} called {name}"]
        )

    # Sometimes fold the location into the opening sentence, in front or behind.
    if "area" in remaining and rng.random() < 0.4:
        remaining.remove("area")
        area = slots["area"]
        if rng.random() < 0.5:
            intro = f"located in the {area} area, {intro}"
        else:
            intro = f"{intro} in the {area} area"
    if "near" in remaining and rng.random() < 0.4:
        remaining.remove("near")
        intro = f"{intro} near {slots['near']}"

    sentences = [_sentence(intro)]
    rng.shuffle(remaining)
    while remaining:
        take = min(len(remaining), rng.randint(1, 3))
        group, remaining = remaining[:take], remaining[take:]
        subject = rng.choice(["it", f"the {noun}", name])
        phrases = [_e2e_verb_phrase(slot, slots[slot], rng) for slot in group]
        sentences.append(_sentence(f"{subject} {_join_phrases(phrases)}"))
    return " ".join(sentences)


def _distinct_references(make, count: int, minimum: int, rng: random.Random, what: str) -> tuple[str, ...]:
    """Up to ``count`` different outputs of ``make(rng)``, at least ``minimum`` (a
    one-triple input may have fewer wordings than asked for)."""
    refs: list[str] = []
    for _ in range(50 * count):
        ref = make(rng)
        if ref not in refs:
            refs.append(ref)
            if len(refs) == count:
                break
    if len(refs) < minimum:
        raise ValueError(f"could not realise {minimum} distinct references for {what}")
    return tuple(refs)


def _check_ref_range(refs_per_input: tuple[int, int], name: str) -> tuple[int, int]:
    low, high = refs_per_input
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {refs_per_input!r}")
    return low, high


def make_synthetic_e2e(n_mrs: int, refs_per_mr: tuple[int, int] = (2, 5), seed: int = 0) -> list[NLGExample]:
    """``n_mrs`` distinct E2E-style MRs, each with a random number in ``refs_per_mr``
    (inclusive) of differently templated references naming every slot value."""
    if not isinstance(n_mrs, int) or n_mrs < 1:
        raise ValueError(f"n_mrs must be a positive integer, got {n_mrs!r}")
    low, high = _check_ref_range(refs_per_mr, "refs_per_mr")
    rng = random.Random(seed)
    # How often each optional slot occurs; real MRs hold 3 to 8 slots.
    slot_probability = {
        "eatType": 0.8, "food": 0.7, "priceRange": 0.6, "customer rating": 0.6,
        "area": 0.7, "familyFriendly": 0.6, "near": 0.5,
    }
    examples: list[NLGExample] = []
    seen: set[str] = set()
    for _ in range(1000 * n_mrs):
        if len(examples) == n_mrs:
            break
        slots = {"name": rng.choice(E2E_VENUE_NAMES)}
        for slot in E2E_SLOT_ORDER[1:]:
            if rng.random() < slot_probability[slot]:
                slots[slot] = rng.choice(E2E_SLOTS[slot])
        if len(slots) < 3:
            continue
        mr = format_mr(slots)
        if mr in seen:
            continue
        seen.add(mr)
        count = rng.randint(low, high)
        refs = _distinct_references(lambda r: _e2e_reference(slots, r), count, low, rng, mr)
        examples.append(NLGExample(source=mr, references=refs))
    if len(examples) < n_mrs:
        raise ValueError(f"could only draw {len(examples)} distinct MRs, asked for n_mrs={n_mrs}")
    return examples


def e2e_value_mentions(slot: str, value: str) -> list[str]:
    """Lower-case strings a reference must contain to express ``slot = value``
    (the yes/no of familyFriendly is worded, not quoted)."""
    if slot == "familyFriendly":
        return ["famil", "not"] if value == "no" else ["famil"]
    if slot == "food":
        return [_food_adjective(value).lower()]
    return [value.lower()]


# ---------------------------------------------------------------------------
# WebNLG 2017


@dataclass(frozen=True)
class _Predicate:
    values: tuple[str, ...]
    verb_phrases: tuple[str, ...]  # with {o}; the subject is put in front
    sentences: tuple[str, ...]  # whole sentences with {s} and {o}


@dataclass(frozen=True)
class _Category:
    subjects: tuple[str, ...]
    pronoun: str  # how a later sentence refers back to the subject
    predicates: dict[str, _Predicate]


# A small slice of WebNLG 2017's seen categories and predicates, with DBpedia-style
# entities. The objects are drawn independently per triple set, so the "facts" are
# invented; only the vocabulary and shape follow the real data.
WEBNLG_SCHEMA: dict[str, _Category] = {
    "Airport": _Category(
        ("Aarhus_Airport", "Abilene_Regional_Airport", "Alderney_Airport", "Amsterdam_Airport_Schiphol",
         "Antwerp_International_Airport", "Atlantic_City_International_Airport"),
        "the airport",
        {
            "cityServed": _Predicate(
                ("Aarhus", "Abilene,_Texas", "Alderney", "Amsterdam", "Antwerp", "Atlantic_City,_New_Jersey"),
                ("serves the city of {o}", "serves {o}"),
                ("The city of {o} is served by {s}.", "{s} is the airport of {o}."),
            ),
            "runwayLength": _Predicate(
                ("2776.0", "2194.0", "877.0", "3800.0", "1600.0", "3453.0"),
                ("has a runway length of {o}", "has a runway that is {o} long"),
                ("The runway length of {s} is {o}.",),
            ),
            "elevationAboveTheSeaLevel": _Predicate(
                ("25.0", "546", "88.0", "-3.3528", "23", "12.0"),
                ("is {o} metres above sea level", "has an elevation of {o} above sea level"),
                ("The elevation of {s} above sea level is {o} metres.",),
            ),
            "location": _Predicate(
                ("Tirstrup", "Taylor_County,_Texas", "Haarlemmermeer", "Deurne,_Belgium", "Egg_Harbor_Township,_New_Jersey"),
                ("is located in {o}", "is in {o}"),
                ("{s} can be found in {o}.",),
            ),
            "operatingOrganisation": _Predicate(
                ("Aktieselskab", "City_of_Abilene", "States_of_Guernsey", "Schiphol_Group"),
                ("is operated by {o}", "is run by {o}"),
                ("{o} operates {s}.",),
            ),
        },
    ),
    "Astronaut": _Category(
        ("Alan_Shepard", "Buzz_Aldrin", "Elliot_See", "William_Anders", "Alan_Bean"),
        "he",
        {
            "birthPlace": _Predicate(
                ("New_Hampshire", "Glen_Ridge,_New_Jersey", "Dallas", "British_Hong_Kong", "Wheeler,_Texas"),
                ("was born in {o}",),
                ("The birthplace of {s} is {o}.", "{s} was a native of {o}."),
            ),
            "birthDate": _Predicate(
                ("1923-11-18", "1930-01-20", "1927-07-23", "1933-10-17", "1932-03-15"),
                ("was born on {o}",),
                ("{s}'s date of birth is {o}.",),
            ),
            "mission": _Predicate(
                ("Apollo_14", "Apollo_11", "Apollo_8", "Apollo_12", "Gemini_10"),
                ("was a crew member of {o}", "took part in the {o} mission"),
                ("{s} flew on {o}.",),
            ),
            "almaMater": _Predicate(
                ("Dartmouth_College", "Massachusetts_Institute_of_Technology", "University_of_Texas_at_Austin",
                 "Air_Force_Institute_of_Technology"),
                ("graduated from {o}", "studied at {o}"),
                ("{s}'s alma mater is {o}.",),
            ),
            "occupation": _Predicate(
                ("Test_pilot", "Fighter_pilot"),
                ("worked as a {o}", "served as a {o}"),
                ("{s} had a career as a {o}.",),
            ),
        },
    ),
    "Building": _Category(
        ("103_Colmore_Row", "200_Public_Square", "3Arena", "Adare_Manor", "Asilomar_Conference_Grounds"),
        "the building",
        {
            "location": _Predicate(
                ("Birmingham", "Cleveland", "Dublin", "Adare", "Pacific_Grove,_California"),
                ("is located in {o}", "stands in {o}"),
                ("{s} is situated in {o}.",),
            ),
            "architect": _Predicate(
                ("John_Madin", "Philip_Charles_Hardwick", "Julia_Morgan", "HOK_SV"),
                ("was designed by {o}",),
                ("{o} was the architect of {s}.",),
            ),
            "floorCount": _Predicate(
                ("23", "45", "4", "12"),
                ("has {o} floors",),
                ("{s} has a floor count of {o}.",),
            ),
            "completionDate": _Predicate(
                ("1976", "1985", "2008", "1862", "1913"),
                ("was completed in {o}",),
                ("The construction of {s} was finished in {o}.",),
            ),
        },
    ),
    "City": _Category(
        ("Albany,_Georgia", "Amarillo,_Texas", "Anderson,_Indiana", "Atlanta", "Auburn,_Alabama"),
        "the city",
        {
            "country": _Predicate(("United_States",), ("is in the {o}",), ("{s} is a city in the {o}.",)),
            "isPartOf": _Predicate(
                ("Dougherty_County,_Georgia", "Potter_County,_Texas", "Madison_County,_Indiana",
                 "Fulton_County,_Georgia", "Lee_County,_Alabama"),
                ("is part of {o}", "lies in {o}"),
                ("{s} is part of {o}.",),
            ),
            "populationTotal": _Predicate(
                ("77434", "190695", "56129", "420003", "53380"),
                ("has a population of {o}", "is home to {o} people"),
                ("The population of {s} is {o}.",),
            ),
            "areaTotal": _Predicate(
                ("144.7", "233.9", "107.4", "347.1"),
                ("covers a total area of {o} square kilometres",),
                ("The total area of {s} is {o} square kilometres.",),
            ),
        },
    ),
    "Food": _Category(
        ("Ajoblanco", "Arrabbiata_sauce", "Bakso", "Bandeja_paisa", "Baked_Alaska", "Bionico"),
        "the dish",
        {
            "country": _Predicate(
                ("Spain", "Italy", "Indonesia", "Colombia", "United_States", "Mexico"),
                ("comes from {o}", "is a dish from {o}"),
                ("{s} originates from {o}.",),
            ),
            "ingredient": _Predicate(
                ("Garlic", "Tomato", "Noodle", "Avocado", "Meringue", "Granola"),
                ("contains {o}", "is made with {o}"),
                ("{o} is an ingredient of {s}.",),
            ),
            "region": _Predicate(
                ("Andalusia", "Rome", "Paisa_Region", "Guadalajara", "Java"),
                ("is a regional dish of {o}",),
                ("{s} comes from the region of {o}.",),
            ),
            "course": _Predicate(
                ("Dessert", "Main_course", "Entree"),
                ("is served as a {o}",),
                ("{s} is eaten as a {o}.",),
            ),
        },
    ),
    "Monument": _Category(
        ("11th_Mississippi_Infantry_Monument", "Baku_Turkish_Martyrs'_Memorial", "Atatürk_Monument"),
        "the monument",
        {
            "location": _Predicate(
                ("Adams_County,_Pennsylvania", "Baku", "Izmir", "Gettysburg,_Pennsylvania"),
                ("is located in {o}", "stands in {o}"),
                ("{s} can be found in {o}.",),
            ),
            "established": _Predicate(
                ("2000", "1932", "1990"), ("was established in {o}",), ("{s} was erected in {o}.",)
            ),
            "designer": _Predicate(
                ("Pietro_Canonica", "Hüseyin_Bütüner_and_Hilmi_Güner"),
                ("was designed by {o}",),
                ("{o} designed {s}.",),
            ),
            "material": _Predicate(
                ("Bronze", "Red_granite_and_white_marble"), ("is made of {o}",), ("{s} is built from {o}.",)
            ),
        },
    ),
    "University": _Category(
        ("Acharya_Institute_of_Technology", "Aarhus_University", "AWH_Engineering_College",
         "Accademia_di_Architettura_di_Mendrisio", "1_Decembrie_1918_University"),
        "the university",
        {
            "city": _Predicate(
                ("Bangalore", "Aarhus", "Kuttikkattoor", "Mendrisio", "Alba_Iulia"),
                ("is located in the city of {o}", "is based in {o}"),
                ("{s} is in {o}.",),
            ),
            "country": _Predicate(
                ("India", "Denmark", "Switzerland", "Romania"),
                ("is in {o}",),
                ("The country of {s} is {o}.",),
            ),
            "numberOfStudents": _Predicate(
                ("700", "16000", "600", "1000"), ("has {o} students",), ("{o} students attend {s}.",)
            ),
            "established": _Predicate(
                ("2000", "1928", "1996", "1991"),
                ("was established in {o}", "was founded in {o}"),
                ("{s} was founded in {o}.",),
            ),
            "academicStaffSize": _Predicate(
                ("737", "250", "100"), ("has an academic staff of {o}",), ("{s} employs {o} academic staff.",)
            ),
        },
    ),
    "WrittenWork": _Category(
        ("A_Fortress_of_Grey_Ice", "A_Glastonbury_Romance", "A_Long_Long_Way", "Aenir",
         "Alcatraz_Versus_the_Evil_Librarians"),
        "the book",
        {
            "author": _Predicate(
                ("J._V._Jones", "John_Cowper_Powys", "Sebastian_Barry", "Garth_Nix", "Brandon_Sanderson"),
                ("was written by {o}",),
                ("{o} is the author of {s}.", "{o} wrote {s}."),
            ),
            "publisher": _Predicate(
                ("Tor_Books", "Macmillan_Publishers", "Viking_Press", "Scholastic_Press"),
                ("was published by {o}",),
                ("{o} published {s}.",),
            ),
            "literaryGenre": _Predicate(
                ("Fantasy_literature", "Novel", "Science_fiction", "Alternate_history"),
                ("is a work of {o}", "belongs to the genre of {o}"),
                ("The genre of {s} is {o}.",),
            ),
            "numberOfPages": _Predicate(
                ("672", "1174", "292", "249", "320"), ("has {o} pages", "is {o} pages long"), ("{s} runs to {o} pages.",)
            ),
        },
    ),
}


def _webnlg_reference(category: str, triples: Sequence[tuple[str, str, str]], rng: random.Random) -> str:
    """A multi-sentence templated reference mentioning every object of ``triples``
    (all share one subject)."""
    schema = WEBNLG_SCHEMA[category]
    subject = entity_text(triples[0][0])
    order = list(triples)
    rng.shuffle(order)
    sentences: list[str] = []
    while order:
        take = min(len(order), rng.randint(1, 2))
        group, order = order[:take], order[take:]
        if take == 1 and rng.random() < 0.4:
            _, predicate, obj = group[0]
            template = rng.choice(schema.predicates[predicate].sentences)
            sentences.append(_sentence(template.format(s=subject, o=entity_text(obj))))
            continue
        who = subject if not sentences or rng.random() < 0.3 else schema.pronoun
        phrases = [
            rng.choice(schema.predicates[predicate].verb_phrases).format(o=entity_text(obj))
            for _, predicate, obj in group
        ]
        sentences.append(_sentence(f"{who} {_join_phrases(phrases)}"))
    return " ".join(sentences)


def make_synthetic_webnlg(
    n_sets: int, seed: int = 0, refs_per_set: tuple[int, int] = (2, 3)
) -> list[NLGExample]:
    """``n_sets`` distinct 1-4-triple sets from ``WEBNLG_SCHEMA`` (one subject each),
    with a random number in ``refs_per_set`` (inclusive) of distinct references; a
    single triple with only two wordings in the schema may get two."""
    if not isinstance(n_sets, int) or n_sets < 1:
        raise ValueError(f"n_sets must be a positive integer, got {n_sets!r}")
    low, high = _check_ref_range(refs_per_set, "refs_per_set")
    rng = random.Random(seed)
    categories = sorted(WEBNLG_SCHEMA)
    examples: list[NLGExample] = []
    seen: set[str] = set()
    for _ in range(1000 * n_sets):
        if len(examples) == n_sets:
            break
        category = rng.choice(categories)
        schema = WEBNLG_SCHEMA[category]
        subject = rng.choice(schema.subjects)
        predicates = rng.sample(sorted(schema.predicates), rng.randint(1, min(4, len(schema.predicates))))
        triples = [(subject, p, rng.choice(schema.predicates[p].values)) for p in predicates]
        source = linearise_triples(triples)
        if source in seen:
            continue
        seen.add(source)
        count = rng.randint(low, high)
        refs = _distinct_references(
            lambda r: _webnlg_reference(category, triples, r), count, min(low, 2), rng, source
        )
        examples.append(NLGExample(source=source, references=refs))
    if len(examples) < n_sets:
        raise ValueError(f"could only draw {len(examples)} distinct triple sets, asked for n_sets={n_sets}")
    return examples
